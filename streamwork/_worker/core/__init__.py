"""The delivery core of a worker: read, admit, start, run, complete, heartbeat, reclaim.

It names no optional feature: features plug in through `seam.Feature`."""
