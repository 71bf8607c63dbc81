"""The fleet: jobs placed across several vmd hosts by Ray (the service's "ray" executor).

host_labels.py names what a host tells Ray about itself; placement.py turns a job into
Ray's scheduling options and asks Ray whether a node still lives; job_host.py is the
actor that runs one job's worker on the host Ray chose. Ray is imported only inside the
functions that need it: the service, the local executor and their tests run without it.
"""
