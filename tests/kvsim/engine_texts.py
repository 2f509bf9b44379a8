"""Expositions in each engine's format, written for the tests from the published metric
names and label names (vLLM ``vllm:*`` with ``model_name``/``engine``; SGLang ``sglang:*``;
trtllm-serve ``trtllm_*``; Triton's TensorRT-LLM backend ``nv_trt_llm_*`` with
``kv_cache_block_type`` max/free/used/tokens_per/fraction). Values are chosen so the expected
readings are simple arithmetic the tests write out by hand."""

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def vllm_v1(engines=(("0", 5, 2, 0.5, 2000, 4, 1000, 250), ("1", 3, 0, 0.25, 2000, 6, 3000, 1500)),
            block_size=16, kv_tokens_label=True) -> str:
    """(engine, running, waiting, usage, num_gpu_blocks, preemptions, queries, hits) per engine."""
    out = []

    def fam(name, kind, help_text, rows):
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(rows)

    lab = lambda e: f'engine="{e[0]}",model_name="{MODEL}"'  # noqa: E731
    fam("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
        [f"vllm:num_requests_running{{{lab(e)}}} {float(e[1])}" for e in engines])
    fam("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
        [f"vllm:num_requests_waiting{{{lab(e)}}} {float(e[2])}" for e in engines])
    fam("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
        [f"vllm:kv_cache_usage_perc{{{lab(e)}}} {e[3]!r}" for e in engines])
    fam("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
        [f"vllm:num_preemptions_total{{{lab(e)}}} {float(e[5])}" for e in engines])
    fam("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.",
        [f"vllm:prefix_cache_queries_total{{{lab(e)}}} {float(e[6])}" for e in engines])
    fam("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
        [f"vllm:prefix_cache_hits_total{{{lab(e)}}} {float(e[7])}" for e in engines])
    rows = []
    for e in engines:
        tokens = f',kv_cache_size_tokens="{e[4] * block_size}"' if kv_tokens_label else ""
        rows.append(
            f'vllm:cache_config_info{{block_size="{block_size}",cache_dtype="auto",calculate_kv_scales="False",'
            f'enable_prefix_caching="True",engine="{e[0]}",gpu_memory_utilization="0.9"{tokens},'
            f'num_cpu_blocks="None",num_gpu_blocks="{e[4]}",num_gpu_blocks_override="None",'
            f'sliding_window="None",swap_space="4"}} 1.0')
    fam("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", rows)
    out.append("# HELP process_resident_memory_bytes Resident memory size in bytes.")
    out.append("# TYPE process_resident_memory_bytes gauge")
    out.append("process_resident_memory_bytes 1.2e+09")
    return "\n".join(out) + "\n"


VLLM_V0 = f"""\
# HELP vllm:cache_config_info information of cache_config
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",cache_dtype="auto",cpu_offload_gb="0",enable_prefix_caching="False",gpu_memory_utilization="0.9",num_cpu_blocks="2048",num_gpu_blocks="5691",num_gpu_blocks_override="None",sliding_window="None",swap_space_bytes="4294967296"}} 1.0
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="{MODEL}"}} 3.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{{model_name="{MODEL}"}} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="{MODEL}"}} 1.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{{model_name="{MODEL}"}} 0.42
# HELP vllm:cpu_cache_usage_perc CPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{{model_name="{MODEL}"}} 0.0
# HELP vllm:gpu_prefix_cache_hit_rate GPU prefix cache block hit rate.
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{{model_name="{MODEL}"}} 0.125
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{model_name="{MODEL}"}} 2.0
"""

SGLANG = f"""\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="{MODEL}"}} 12.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{{model_name="{MODEL}"}} 30000.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{model_name="{MODEL}"}} 0.3
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{{model_name="{MODEL}"}} 100000.0
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{{model_name="{MODEL}"}} 1520.5
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="{MODEL}"}} 4.0
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{{model_name="{MODEL}"}} 0.0075
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{model_name="{MODEL}"}} 8.128902e+06
"""

TRTLLM = f"""\
# HELP trtllm_num_requests_running Number of requests currently running.
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{{engine_type="trtllm",model_name="{MODEL}"}} 4.0
# HELP trtllm_num_requests_waiting Number of requests waiting.
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{{engine_type="trtllm",model_name="{MODEL}"}} 1.0
# HELP trtllm_kv_cache_utilization KV cache utilization (used / max blocks).
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{{engine_type="trtllm",model_name="{MODEL}"}} 0.5
# HELP trtllm_kv_cache_hit_rate KV cache reuse hit rate.
# TYPE trtllm_kv_cache_hit_rate gauge
trtllm_kv_cache_hit_rate{{engine_type="trtllm",model_name="{MODEL}"}} 0.2
# HELP trtllm_kv_cache_max_blocks KV cache blocks in the pool.
# TYPE trtllm_kv_cache_max_blocks gauge
trtllm_kv_cache_max_blocks{{engine_type="trtllm",model_name="{MODEL}"}} 6000.0
# HELP trtllm_kv_cache_used_blocks KV cache blocks in use.
# TYPE trtllm_kv_cache_used_blocks gauge
trtllm_kv_cache_used_blocks{{engine_type="trtllm",model_name="{MODEL}"}} 3000.0
# HELP trtllm_kv_cache_free_blocks KV cache blocks free.
# TYPE trtllm_kv_cache_free_blocks gauge
trtllm_kv_cache_free_blocks{{engine_type="trtllm",model_name="{MODEL}"}} 3000.0
# HELP trtllm_kv_cache_tokens_per_block Tokens per KV cache block.
# TYPE trtllm_kv_cache_tokens_per_block gauge
trtllm_kv_cache_tokens_per_block{{engine_type="trtllm",model_name="{MODEL}"}} 32.0
"""

TRITON = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="ensemble",version="1"} 42
nv_inference_request_success{model="tensorrt_llm",version="1"} 42
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 5
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 2
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 624
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 5616
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 6240
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.1
"""

NODE_EXPORTER = """\
# HELP node_memory_MemFree_bytes Memory information field MemFree_bytes.
# TYPE node_memory_MemFree_bytes gauge
node_memory_MemFree_bytes 1.2e+10
"""
