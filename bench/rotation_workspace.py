"""What rotating a chunk of images leaves allocated on the GPU, with the sampling grid made by
F.affine_grid (a batched matrix multiply) and elementwise (dmls.data.device_resident), each in a
fresh process, against what one plain matrix multiply leaves (cuBLAS's workspace):

    python bench/rotation_workspace.py [--images 5000] [--size 28]

Why: in the example's A4 the augmentation run (rotation 10°) measured "GPU memory a step adds"
32 MiB below the bare baseline's, with the same absolute peak in the steady steps: the bytes held
as its first step began were 32 MiB higher. Prints one line per case and the host's GPU and
torch; needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASE = r"""
import json, math, sys
import torch
import torch.nn.functional as F
case, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
x = torch.rand(n, 1, size, size, device="cuda")
torch.cuda.synchronize()
before = torch.cuda.memory_allocated()
if case == "matmul":
    a = torch.ones(2, 2, device="cuda")
    out = a @ a
else:
    # (both rotation cases keep these n angles alive to the end, 20,480 bytes for 5,000, so
    # that they count the same; the elementwise case's BatchAugment draws its own)
    angle = torch.empty(n, device="cuda").uniform_(-math.radians(10), math.radians(10))
    if case == "affine_grid":
        cos, sin, zero = angle.cos(), angle.sin(), torch.zeros_like(angle)
        theta = torch.stack([cos, -sin, zero, sin, cos, zero], dim=1).view(n, 2, 3)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        out = F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)
        del grid
    else:
        sys.path.insert(0, "workflow/scripts")
        from dmls.config.spec import AugmentSpec
        from dmls.data.device_resident import BatchAugment
        spec = AugmentSpec(random_crop=False, horizontal_flip=False, color_jitter=0.0,
                           rotation_degrees=10.0)
        out = BatchAugment(spec, [0.0], [1.0], x.device)._rotate(x, 10.0)
del out
torch.cuda.synchronize()
left = torch.cuda.memory_allocated() - before
print(json.dumps({"case": case, "left_allocated_bytes": left,
                  "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=5000, help="images in the chunk")
    parser.add_argument("--size", type=int, default=28, help="image side, pixels")
    args = parser.parse_args()
    for case in ("matmul", "affine_grid", "elementwise"):
        out = subprocess.run(
            [sys.executable, "-c", CASE, case, str(args.images), str(args.size)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        row = json.loads(out.strip().splitlines()[-1])
        mib = row["left_allocated_bytes"] / 2**20
        print(
            f"{case:12s} left {row['left_allocated_bytes']:>12,} bytes allocated "
            f"({mib:.1f} MiB) after its outputs were freed  [{row['gpu']}, torch "
            f"{row['torch']}]"
        )
    print(
        f"(chunk: {args.images} images of 1×{args.size}×{args.size}; a case that leaves what "
        "`matmul` leaves allocated cuBLAS's workspace)"
    )


if __name__ == "__main__":
    main()
