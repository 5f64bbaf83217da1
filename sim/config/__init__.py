"""The scenario: one YAML file, one simulated deployment and its traffic
(`scenario`), its cluster of replica groups behind a router (`cluster`), and the
defaults a serving stack at a version brings under the scenario's own settings
(`stackdefaults`).
"""
