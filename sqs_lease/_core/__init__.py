"""The protocol core: pure, no I/O, no clock, no boto3/botocore/pynamodb import.

Every protocol step is a generator flow that yields instructions
(:class:`Call`, :class:`Sleep`, :class:`Emit`) and receives outcomes. The sync,
async and simulation drivers execute the instructions; the decisions live here once.
"""
