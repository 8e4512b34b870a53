"""One module per notebook question: the notebooks' logic, verdicts and figures.

baseline (00), kvcache (01), blocksize (02), prefill and roofline (03), headroom (04), assemble,
presets and explorer (05), plots (figures shared by several). Each returns data or figures; the
notebooks display them.
"""
