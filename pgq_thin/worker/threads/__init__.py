"""The thread runtime's parts (Worker): generated from the asyncio parts in pgq_thin/worker/ by
scripts/async_to_sync.py (each file says so), but for waits.py, the thread twin of
pgq_thin/worker/waits.py: how a part waits when it is a thread."""
