"""Assembled by tunebook 05_assemble_config for scenario high_concurrency_chat
objective: max goodput_rps, then max request_throughput_rps, then max output_throughput_tok_s under the SLO
SLO: ttft_ms <= 500, tpot_ms <= 50
block_size=128: 02_block_size_sweep/block_size (changed)
evidence: choice.json beside this file
"""

kwargs = {
    'model': 'models/ernie-4.5-0.3b-pt',
    'load_format': 'dummy',
    'block_size': 128,
}

if __name__ == "__main__":
    from vllm import LLM

    llm = LLM(**kwargs)
    print(llm.generate(["Hello"])[0].outputs[0].text)
