"""The scenario: one YAML file, one simulated deployment and its traffic
(`scenario`), and its cluster of replica groups behind a router (`cluster`).
"""
