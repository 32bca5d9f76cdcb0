"""conftest.py - what several test files share: te_weight_grads, the check of Transformer
Engine's weight-gradient options on a module against the same module without them."""
import pytest


@pytest.fixture
def te_weight_grads():
    """check(plain, te, run, weights, others): `plain` and `te` are the same module (same
    weights) without and with fuse_wgrad_accumulation / delay_wgrad_compute; run(module,
    first_microbatch) does one forward + backward. Two microbatches each; then with fusion
    te's main_grad of each weight (started random) is the plain module's accumulated .grad
    (the first microbatch overwrote it) and the DDP dummy grad is zero, without it the .grad
    is; with delay, nothing reaches the weights before backward_dw(). `others` maps names to
    (plain's tensor, te's tensor[, n]): parameters and inputs whose .grad (its first n rows)
    must be the plain module's either way, to `tol` of the largest magnitude."""
    import torch

    def check(plain, te, run, weights, others, tol=1e-5):
        params = [getattr(te, n) for n in weights]
        for p in params:
            p.main_grad = torch.randn(p.shape, device=p.device)
            p.grad_added_to_main_grad = False
        for micro in range(2):
            run(plain, micro == 0)
            mains = [p.main_grad.clone() for p in params]
            run(te, micro == 0)
            if te.delay_wgrad_compute:   # nothing reached the weights before backward_dw
                if te.fuse_wgrad_accumulation:
                    assert all(torch.equal(m, p.main_grad) for m, p in zip(mains, params)), "main_grad before backward_dw"
                elif micro == 0:
                    assert all(p.grad is None for p in params), "a weight got its .grad before backward_dw"
                te.backward_dw()
        def close(got, want, what):   # relative to the largest magnitude (sums in other orders)
            m = want.double().abs().max().clamp_min(1.0)
            torch.testing.assert_close(got.double() / m, want.double() / m, rtol=tol, atol=tol,
                                       msg=lambda msg: f"{what}: {msg}")

        for name, p in zip(weights, params):
            want = getattr(plain, name).grad
            if te.fuse_wgrad_accumulation:
                close(p.main_grad, want, f"{name}.main_grad")
                assert p.grad_added_to_main_grad and torch.count_nonzero(p.grad) == 0
            else:
                close(p.grad, want, f"{name}.grad")
        for name, (a, b, *rows) in others.items():
            sel = slice(None, rows[0] if rows else None)
            close(b.grad[sel], a.grad[sel], f"{name}.grad")

    return check
