"""One machine's own state: private temporary directories swept once their owner is gone, and import hooks
that adjust a third-party module in place as it is first imported. No Spark and no torch at import.
"""
