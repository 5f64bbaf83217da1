"""What a person reads: the summary as text (`text`), reports as HTML and Markdown
(`document`, `pages`, `plan_page`, `deploy_page`), and runs as Perfetto traces (`perfetto`).
"""
