"""Reference values for the trainer's numerics, computed with PyTorch and transformers.

Run by hand (not in CI), in a venv of scripts/requirements-train.txt (`make
bench-out/venv-train/.ok` makes one):  bench-out/venv-train/bin/python scripts/train_reference.py
Writes tests/fixtures/train/reference.json, which the Rust tests in train/src/{loss,optim}.rs read:

* loss: the contract's loss (soft-target cross-entropy + brier_weight x multi-class Brier, target
  blended with the teacher only when the teacher's arg-max is the answer), its value and its
  gradient with respect to the option logits, from torch autograd;
* adamw: three steps of torch.optim.AdamW (eps 1e-8, weight decay on the matrix only, as two
  parameter groups) with torch.nn.utils.clip_grad_norm_ on given gradients;
* schedule: transformers.get_cosine_schedule_with_warmup multipliers;
* next_token: the optional auxiliary term ([loss] lm_weight): torch cross_entropy of next-token
  logits, averaged over the unmasked (real, non-padding) positions, and its logit gradient.
"""
import json
import pathlib

import torch
from transformers import get_cosine_schedule_with_warmup

torch.manual_seed(0)
out = {}


def contract_loss(logits, answer, teacher, blend, beta):
    p = torch.softmax(logits, -1)
    n = logits.shape[-1]
    onehot = torch.nn.functional.one_hot(torch.tensor(answer), n).to(logits.dtype)
    q = onehot.clone()
    if teacher is not None:
        t = torch.tensor(teacher, dtype=logits.dtype)
        if t[answer] >= t.max():
            q = (1 - blend) * onehot + blend * t
    ce = torch.nn.functional.cross_entropy(logits.unsqueeze(0), q.unsqueeze(0))
    brier = ((p - onehot) ** 2).sum()
    return ce + beta * brier


cases = []
specs = [
    (3, 1, None, 0.3, 0.5),
    (4, 0, [0.7, 0.1, 0.1, 0.1], 0.3, 0.5),   # teacher agrees
    (4, 2, [0.6, 0.1, 0.2, 0.1], 0.3, 0.5),   # teacher disagrees
    (5, 4, [0.1, 0.1, 0.1, 0.2, 0.5], 1.0, 0.0),
    (2, 0, [0.5, 0.5], 0.5, 2.0),             # tie for first counts as agreeing
]
for n, answer, teacher, blend, beta in specs:
    logits = (torch.randn(n, dtype=torch.float64) * 2).requires_grad_()
    loss = contract_loss(logits, answer, teacher, blend, beta)
    loss.backward()
    cases.append({
        "logits": logits.detach().tolist(), "answer": answer, "teacher": teacher,
        "teacher_blend": blend, "brier_weight": beta,
        "loss": loss.item(), "grad": logits.grad.tolist(),
    })
out["loss"] = cases

w = torch.randn(3, 4, dtype=torch.float32)
b = torch.randn(4, dtype=torch.float32)
pw, pb = w.clone().requires_grad_(), b.clone().requires_grad_()
opt = torch.optim.AdamW(
    [{"params": [pw], "weight_decay": 0.1}, {"params": [pb], "weight_decay": 0.0}],
    lr=0.05, betas=(0.9, 0.95), eps=1e-8,
)
grads, norms, lrs = [], [], [0.05, 0.03, 0.01]
for step, lr in enumerate(lrs):
    gw = torch.randn(3, 4) * (step + 1)
    gb = torch.randn(4) * (step + 1)
    grads.append({"w": gw.flatten().tolist(), "b": gb.tolist()})
    pw.grad, pb.grad = gw.clone(), gb.clone()
    norms.append(torch.nn.utils.clip_grad_norm_([pw, pb], max_norm=2.0).item())
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
out["adamw"] = {
    "w0": w.flatten().tolist(), "b0": b.tolist(), "w_shape": [3, 4],
    "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "clip": 2.0,
    "lrs": lrs, "grads": grads, "norms": norms,
    "w": pw.detach().flatten().tolist(), "b": pb.detach().tolist(),
}

param = torch.nn.Parameter(torch.zeros(1))
o = torch.optim.SGD([param], lr=1.0)
sched = get_cosine_schedule_with_warmup(o, num_warmup_steps=7, num_training_steps=40)
mult = []
for _ in range(45):
    mult.append(o.param_groups[0]["lr"])
    o.step()
    sched.step()
out["schedule"] = {"warmup": 7, "total": 40, "multipliers": mult}

lm_logits = (torch.randn(2, 4, 6, dtype=torch.float64) * 2).requires_grad_()
lm_next = torch.randint(0, 6, (2, 4))
lm_mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.float64)  # row 2 left-padded
ce = torch.nn.functional.cross_entropy(lm_logits.reshape(-1, 6), lm_next.reshape(-1), reduction="none")
lm_loss = (ce * lm_mask.reshape(-1)).sum() / lm_mask.sum()
lm_loss.backward()
out["next_token"] = {
    "logits": lm_logits.detach().flatten().tolist(), "shape": [2, 4, 6],
    "next": lm_next.flatten().tolist(), "mask": lm_mask.flatten().tolist(),
    "loss": lm_loss.item(), "grad": lm_logits.grad.flatten().tolist(),
}

path = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/train/reference.json"
path.write_text(json.dumps(out, indent=1) + "\n")
print("wrote", path)
