"""``rewrite advise PROFILE [--model opt.onnx]``: read a GPU profile of a MIGraphX run, advise.

Input formats (PROFILE is one CSV file or a directory searched recursively; files are
recognised by name and header, so ``-o``/``-d`` prefixes and ``pmc_N/`` subfolders are fine):

rocprofv3 (ROCprofiler-SDK), written with ``--output-format csv`` (rocpd ``.db`` is the
default from ROCm 7.0; ``rocpd convert -i X_results.db --output-format csv`` turns it into CSV)
  ``*kernel_stats.csv``        (``--kernel-trace --stats``) Name, Calls, TotalDurationNs,
                               AverageNs, Percentage, MinNs, MaxNs, StdDev
  ``*kernel_trace.csv``        (``--kernel-trace``) one row per dispatch: Kernel_Name,
                               Start_Timestamp, End_Timestamp, Dispatch_Id, ...
  ``*counter_collection.csv``  (``--pmc ...``) one row per dispatch *and counter*:
                               Dispatch_Id, Kernel_Name, Counter_Name, Counter_Value,
                               Start_Timestamp, End_Timestamp, ...
legacy rocprof (v1)
  ``<out>.stats.csv``          (``--stats``) Name, Calls, TotalDurationNs, AverageNs, Percentage
  ``<out>.csv``                (``-i input.txt``) one row per dispatch: Index, KernelName,
                               gpu-id, ..., then one column per requested counter, then
                               DispatchNs, BeginNs, EndNs, CompleteNs (with timestamps on)
Column names are matched ignoring case, ``_``, ``-`` and spaces, with a few known aliases
(KernelName / Kernel_Name, BeginNs / Start_Timestamp, ...). A missing column, an empty or
truncated file, or a non-number where a number belongs is a :class:`ProfileError`: one line.

The decision tree (thresholds are options; the counters behind each number are named in the
output, and a missing counter is reported with the rocprofv3 command that collects it, never
guessed)::

    VALU busy < 60%  -> fusion    (the vector ALUs idle: launch/elementwise overhead, unfused
                                   activations, standalone quantize kernels)
    else SQ wait > 30% -> memory  (waves stall waiting to issue: layout, alignment, bandwidth)
    else             -> quantize  (compute-bound and busy: fewer bits per MAC is what is left)

VALU busy is the derived counter ``VALUBusy`` (rocprofv3 and legacy rocprof both define it:
100 * SQ_ACTIVE_INST_VALU / CU_NUM / GRBM_GUI_ACTIVE on gfx942), averaged over dispatches
weighted by duration. SQ wait is 100 * sum(SQ_WAIT_INST_ANY) / sum(SQ_WAVE_CYCLES): the share
of wave lifetime spent waiting to issue an instruction (both counters are in the same
wave-cycle units).

Kernel names: MIGraphX names each compiled kernel after the ops fused into it, e.g.
``mlir_convolution_add_relu`` (rocMLIR conv + bias + ReLU), ``mlir_quant_convolution_...``
(an INT8 conv), ``add_relu_kernel`` (a JIT pointwise kernel), ``quantizelinear_kernel`` (a
standalone quantize that did not fuse). Convolutions MIGraphX hands to MIOpen and GEMMs it
hands to rocBLAS/hipBLASLt carry those libraries' names (``igemm_fwd_...``, ``Cijk_...``).
The names carry op *types*, not ONNX node names, so with ``--model`` a kernel is matched to
the nodes whose pattern it can be (e.g. Conv nodes followed by Relu), not to one node.
"""

from rewriter.advise.advice import Advice, advise, decide, main
from rewriter.advise.kernels import classify_kernel
from rewriter.advise.profiles import ProfileError, clean_kernel_name, load_profile

__all__ = ["Advice", "ProfileError", "advise", "classify_kernel", "clean_kernel_name", "decide",
           "load_profile", "main"]
