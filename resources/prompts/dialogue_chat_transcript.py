"""A support conversation, kept as an example for the transcript parser.

Customer: Hello, I ordered a lamp last week and it has not arrived yet.
Agent: I am sorry to hear that.  Could you give me the order number?
Customer: Yes, it is 48213.
Agent: Thank you.  The parcel left our warehouse on Monday and the carrier
    says it will be delivered tomorrow.
Customer: Tomorrow is fine, but I will not be at home in the morning.
Agent: The carrier can leave it with a neighbour or at the post office.
    Which would you prefer?
Customer: The post office, please.
Agent: Done.  You will get a message when it is ready to be collected.
Customer: Thank you.  Can I also change the colour of the second lamp I
    ordered?
Agent: The second lamp has not been packed yet, so yes.  Which colour would
    you like instead?
Customer: Green, if you have it.
Agent:
