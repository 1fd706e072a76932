"""`kbsweep calibrate` on the CPU path: measures, stores beside the datasheet, and can write the spec."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parent.parent


def test_calibrate_measures_and_writes_spec(cli, outputs, tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(REPO / "roofline_specs/cpu.yaml", specs / "cpu.yaml")
    proc = cli("calibrate", "gpu=cpu", f"paths.roofline_specs=[{specs}]", "calibrate.write_spec=true")
    assert proc.returncode == 0, proc.stderr
    stored = OmegaConf.load(outputs / "calibration/cpu.yaml")
    assert stored.copy_gbps > 0.1 and stored.peaks_tflops.fp32 > 0.001
    spec = OmegaConf.load(specs / "cpu.yaml")
    assert spec.measured.copy_gbps == stored.copy_gbps
    assert spec.dram_gbps == OmegaConf.load(REPO / "roofline_specs/cpu.yaml").dram_gbps  # datasheet kept beside


@pytest.mark.fast
def test_the_timer_and_a_gemm_on_the_cpu():
    """The calibration's pieces on a tiny CPU GEMM: a positive time per call."""
    import torch

    from kbsweep.score.calibrate import gemm, timed

    assert timed(gemm("fp32", 64, torch.device("cpu")), torch.device("cpu"), repeats=3) > 0
