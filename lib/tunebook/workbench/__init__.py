"""The workbench: running the notebooks and reading what they left.

runner (headless, papermill), early (kernels started ahead), notebook (the first and last cell
every notebook shares), workbook (a notebook's run folder and sweeps), profiles (params/*.yaml),
console (logs and progress lines), cost (device-seconds), report (the HTML report).
"""
