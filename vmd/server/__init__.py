"""vmd as a process: the JSON-RPC server (rpc.py), the command line (cli.py), the doctor
(doctor.py), `vmd sessions` (session_list.py), and what runs beside the sessions: the
reaper and adoption (lifecycle.py), the push retries (push_retrier.py)."""
