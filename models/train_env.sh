# Sourced by models/*.sh: what makes PyTorch on 2 CPU cores fast enough.
# OpenBLAS (libopenblas0-pthread) single-threaded per op, torch's own
# threads for the rest; glibc must not hand large buffers back to the
# kernel after every step (page faults are expensive on these VMs).
export OPENBLAS_NUM_THREADS=1
export MALLOC_MMAP_THRESHOLD_=17179869184
export MALLOC_TRIM_THRESHOLD_=17179869184
export MALLOC_TOP_PAD_=1073741824
