"""One machine's own state: private temporary directories swept once their owner is gone, import hooks that
adjust a third-party module in place as it is first imported, and what the machine and process allow (free disk,
open files, OOM kills). No Spark and no torch at import.
"""
