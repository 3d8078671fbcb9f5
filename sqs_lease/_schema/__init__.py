"""The table schema: pynamodb models and every DynamoDB request the core sends.

The core decides when to send a request and what its answer means; these modules say
how it is written (the core is handed the ``*Requests`` protocols they implement).
"""
