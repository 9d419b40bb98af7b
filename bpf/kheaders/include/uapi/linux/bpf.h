/* Stub: BCC ships its own complete copy of this header (compat/linux/virtual_bpf.h). */
