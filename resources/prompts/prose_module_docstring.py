"""Scheduling of delayed jobs.

This module keeps a queue of jobs that are to run at some later time.  Each
job is a callable together with the arguments it is called with, the time at
which it becomes due and a priority that breaks ties between jobs due at the
same moment.  The queue does not start threads of its own: the caller asks it
for the jobs that are due and runs them, so the module can be used from an
event loop, from a worker thread or from a plain loop in the main program.

Jobs that raise an exception are not run again.  The exception is passed to
the error handler of the queue, if one was given, and otherwise it is logged
and discarded.  A job may schedule other jobs while it runs; they are added
to the queue after the job has returned, so that a job which keeps
rescheduling itself cannot starve the others.

Times are measured with the clock that was given to the constructor, which
defaults to time.monotonic.  Using a clock that can go backwards, such as
