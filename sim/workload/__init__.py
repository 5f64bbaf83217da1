"""Requests: arrival times and prompt/output lengths drawn from distributions or
length files (`requests`), recorded traces (`traces`), and synthetic shared prefixes
and multi-turn conversations (`prefixes`), closed-loop benchmark clients (`clients`).
"""
