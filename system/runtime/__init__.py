"""Execution machinery: where clients live and how a run survives interruption.

``executors`` (the one contract; sequential), ``choose`` (which one a run uses), ``fork`` (local worker processes, the CPU default),
``raypool`` (Ray workers on several devices and machines), ``reaper`` (Ray's processes end with the run),
``state`` (a client's or server's state as tensors and plain values), ``parking`` (client state off the
device), ``checkpoint`` (save, resume, recover a lost worker), ``faults`` (simulated slow clients). Nothing here
imports an algorithm: clients are reached through their methods only.
"""
