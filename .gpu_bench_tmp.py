import time, torch
from mmproc.model import load_encoder
from mmproc.model.moonvit import select_rope
from mmproc.model.rope import apply_rope
from mmproc.batching import pack_images
from mmproc.types import PreprocessedImage
m = load_encoder(None, preset="kimi-vl", device="cuda", dtype="bfloat16")
def bench(grids, label):
    imgs = [PreprocessedImage(torch.rand(h*w,3,14,14)*2-1, (h,w), h*w//4) for h,w in grids]
    b = pack_images(imgs, pin_memory=True)
    out = torch.empty(b.num_tokens, m.output_dim, device="cuda", dtype=torch.bfloat16)
    res = {}
    with torch.inference_mode():
        m(b, out=out)
        key, attn_fn, rope_fn = m.tower._kernels
        for nm, fn in [("auto:" + select_rope(m.device)[0], rope_fn), ("eager", apply_rope)]:
            m.tower._kernels = (key, attn_fn, fn)
            for _ in range(3): m(b, out=out)
            torch.cuda.synchronize(); t=time.time(); n=10
            for _ in range(n): m(b, out=out)
            torch.cuda.synchronize(); dt=(time.time()-t)/n
            res[nm] = out.float().clone()
            print(label, b.num_patches, nm, f"{dt*1e3:.1f} ms, {b.num_patches/dt:.0f} patches/s", flush=True)
    a, e = res.values()
    print("  rel diff", ((a-e).norm()/e.norm()).item())
bench([(32, 32)] * 8 + [(64, 48), (18, 26), (100, 60)], "mixed")
bench([(16, 16)] * 64, "64x256")
bench([(32, 32)] * 16, "16x1024")
