"""Crash safety and processes: atomic writes (atomic), temps left by killed writers (temps, janitor), the test hook
that kills a writer mid-write (killpoint), and several processes training one run (distributed)."""
