"""The pipeline API as ``dstk.models`` re-exports it (lazily: importing dstk.models stays light)."""

from __future__ import annotations

import subprocess
import sys


def test_models_package_reexports_lazily():
    code = ("import sys, dstk.models as m; assert callable(m.__getattr__); "
            "print(','.join(x for x in ('torch', 'deepspeed', 'transformers') if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    import dstk.models
    from dstk.pipeline.build import pipeline_from_pretrained, to_pipeline
    from dstk.pipeline.export import export_hf

    assert dstk.models.to_pipeline is to_pipeline
    assert dstk.models.pipeline_from_pretrained is pipeline_from_pretrained
    assert dstk.models.export_hf is export_hf
