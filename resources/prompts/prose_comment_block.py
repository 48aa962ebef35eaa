import bisect


# Overview of the algorithm
# -------------------------
#
# The index keeps the intervals sorted by their start point in one list and,
# in a second list of the same length, the largest end point of any interval
# at or before each position.  A query for the intervals that contain a point
# first finds, with a binary search, the last interval that starts at or
# before the point.  Every interval after it starts too late to contain the
# point, so only the prefix of the list up to that position has to be looked
# at.  The second list tells us where that prefix can be cut short: once the
# largest end point seen so far is smaller than the point, no earlier interval
# can reach it either, and the scan stops.
#
# Inserting an interval keeps both lists in order.  The new interval goes to
# the position that bisect finds for its start point, and the running maxima
# after that position are recomputed.  In the worst case this touches every
# later entry, which is why the index is meant for data that is built once and
# queried many times.  When many intervals are added at once it is faster to
