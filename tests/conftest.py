import os

# Qt tests run headless everywhere.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import torch

# The tests run tiny models, where intra-op threads cost more than they give; one thread
# also keeps a 2-core CI machine from oversubscribing.
torch.set_num_threads(1)
