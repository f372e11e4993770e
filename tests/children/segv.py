"""Die of a segmentation fault."""

import os
import signal

os.kill(os.getpid(), signal.SIGSEGV)
