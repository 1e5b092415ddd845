"""torch's own RPC test suites, run raw and with nbrpc's patches in every test process (see run.py)."""
