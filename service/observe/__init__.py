"""The ground floor: what watches the process (metrics, logs and their writer thread, CPU by role, GC pauses,
loop lag). Everything above may report here; nothing here imports the floors above."""
