"""Test-only STAND-IN for PyTorch in the simulator's serving image: no GPU, no NCCL here.

It carries just what launch/nccl-allreduce-check.py asks of torch, so the NCCL check's ranks
run on the simulated nodes for real — their roll call, their rendezvous over the head's first
rail, their all_reduce across the cable, their verdict — and the scenarios can see that the
ranks run together or not at all. What it cannot be is the bandwidth: a tensor here is its
length and one value (the check only fills with ones), so all_reduce moves the values, not the
bytes, and the bus bandwidth the check reports is no measurement (the sim stack's floor is
set low for that reason). Which network "NCCL" chose follows what reached the container: IB
when the node's /dev/infiniband came through `--device` and NCCL_IB_HCA names an HCA (and
NCCL_IB_DISABLE is not 1), else Socket.
"""

from . import cuda, distributed, version  # noqa: F401

float32 = "float32"
__version__ = "0+twinspark.sim.standin"


class Scalar:
    def __init__(self, value: float):
        self.value = value

    def item(self) -> float:
        return self.value


class Tensor:
    """A tensor whose every element holds the same value."""

    def __init__(self, length: int, value: float, dtype: str = float32, device: str = "cpu"):
        self.length, self.value, self.dtype, self.device = length, value, dtype, device

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Scalar:
        if not -self.length <= index < self.length:
            raise IndexError(f"index {index} is out of bounds for size {self.length}")
        return Scalar(self.value)


def ones(length: int, dtype: str = float32, device: str = "cpu") -> Tensor:
    return Tensor(int(length), 1.0, dtype, device)
