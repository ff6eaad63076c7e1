"""Crash safety and processes: atomic writes (atomic), temps left by killed writers (temps, janitor), the callbacks
a write runs as it commits (write_hooks), the test hook that kills a writer mid-write (killpoint: registered only
when its variable is set), several processes training one run (distributed), the garbage collector's pace in a
stage's process (collector), and the XLA programs a stage keeps for later stages and runs (compile_cache)."""

from vlmgym.runtime import killpoint

killpoint.install_if_set()
