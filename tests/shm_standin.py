"""A stand-in engine process that maps a /dev/shm file it made, as vLLM's engine core maps its MessageQueue
segment: ``python -c MAP_SHM TOLD`` makes ``/dev/shm/vllm-repro-test-<hex>``, maps it, writes its path to ``TOLD``
(atomically: whoever waits for the file reads it whole), then waits to be killed."""

MAP_SHM = """
import mmap, os, sys, time, uuid
path = "/dev/shm/vllm-repro-test-" + uuid.uuid4().hex
fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096)
with open(sys.argv[1] + ".part", "w") as f:
    f.write(path)
os.rename(sys.argv[1] + ".part", sys.argv[1])
time.sleep(300)
"""
