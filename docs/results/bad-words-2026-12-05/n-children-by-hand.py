import os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
from vllm.v1.sample import sampler as S
orig = S.Sampler.apply_bad_words
seen = []
def patched(self, logits, md):
    seen.append((bool(md.bad_words_token_ids), [list(x)[-3:] for x in md.output_token_ids][:2]))
    return orig(self, logits, md)
S.Sampler.apply_bad_words = patched
model = sys.argv[1]
llm = LLM(model=model, skip_tokenizer_init=False, dtype="float32", enforce_eager=True, max_model_len=256,
          async_scheduling=False)
g = llm.generate([{"prompt_token_ids": [5, 6]}], SamplingParams(temperature=0, max_tokens=6))[0].outputs[0].token_ids
print("greedy", list(g))
chain = [6] + list(g)
bad = [f"<{a}> <{b}>" for a, b in zip(chain[1:], chain[2:])]
sp = SamplingParams(temperature=0, max_tokens=6, bad_words=bad)
print("bad ids", sp.bad_words, )
out = llm.generate([{"prompt_token_ids": [5, 6]}], sp)[0].outputs[0].token_ids
print("with bad words", list(out))
print("seen", seen[-4:])
for kw in ({"temperature": 1.0, "seed": 7}, {"temperature": 1.0, "seed": 7, "n": 4}, {"temperature": 1.0, "seed": 7, "logprobs": 1}):
    seen.clear()
    sp = SamplingParams(max_tokens=6, bad_words=bad, **kw)
    outs = llm.generate([{"prompt_token_ids": [5, 6]}], sp)[0].outputs
    print(kw, [list(o.token_ids) for o in outs], "md bad", seen[1][0] if len(seen) > 1 else seen)
