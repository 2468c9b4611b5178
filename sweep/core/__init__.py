"""The pure core: the search space, the score, time budgets, and the stored trial record.

Nothing here runs a process, opens a socket or touches a database.
"""
