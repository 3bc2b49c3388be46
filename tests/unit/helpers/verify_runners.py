"""Runners for fusegemm/verify.py's watchdog child (``check_class(runner="verify_runners:NAME")``),
standing in for a device: they report ``built`` and then pass, hang, die or raise."""
from __future__ import annotations

import os
import sys
import time

from fusegemm.selftest import Row


def passing(cls, device, built):
    built()
    return [Row(cls.family, f"{cls.slug}: case", "pass", 0.0, detail=f"device {device}")]


def slow_build(cls, device, built):
    time.sleep(1.5)          # building is not what the run limit bounds
    built()
    return [Row(cls.family, "c", "pass", 0.0)]


def hanging(cls, device, built):
    import subprocess
    helper = subprocess.Popen(["sleep", "600"])   # something the check started (its process group)
    with open(os.environ["VERIFY_TEST_PIDFILE"], "w") as f:
        f.write(f"{os.getpid()} {helper.pid}")
    built()                  # after the pid file: the run limit cannot stop it unwritten on a loaded machine
    time.sleep(600)          # a kernel that never finishes
    return []


def dying(cls, device, built):
    built()
    sys.stderr.write("CUDA error: an illegal memory access was encountered\n")
    sys.stderr.flush()
    os._exit(134)            # how a device fault ends a process that checks its launches


def raising(cls, device, built):
    raise RuntimeError("the kernel could not be loaded")


def failing(cls, device, built):
    built()
    return [Row(cls.family, "ragged", "pass", 0.0), Row(cls.family, "discrete", "FAIL", 3.5, detail="max error 3.5")]


def config_echo(cls, device, built):
    from fusegemm.runtime import config
    built()
    return [Row(cls.family, "c", "pass", 0.0, detail=f"{config.cache_dir()} {config.trust_unverified()}")]


def unavailable(cls, device, built):
    built()
    return [Row(cls.family, "c", "not available", detail="tile not implemented")]
