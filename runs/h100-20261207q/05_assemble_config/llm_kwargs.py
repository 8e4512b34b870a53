"""Assembled by tunebook 05_assemble_config for scenario high_concurrency_chat
objective: max goodput_rps, then max request_throughput_rps, then max output_throughput_tok_s under the SLO
SLO: ttft_ms <= 500, tpot_ms <= 50, itl_ms <= 1000
no measured setting beat vLLM's default beyond the noise: defaults kept
evidence: choice.json beside this file
"""

kwargs = {
    'model': 'models/qwen3-0.6b',
    'load_format': 'dummy',
}

if __name__ == "__main__":
    from vllm import LLM

    llm = LLM(**kwargs)
    print(llm.generate(["Hello"])[0].outputs[0].text)
