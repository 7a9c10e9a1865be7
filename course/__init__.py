"""The course's machinery: one source for what every notebook carries.

Each notebook must run alone on Colab and Kaggle, so it holds copies of the modules it needs, in
folded helper cells that `make sync` writes from these files (tools/course_cells.py); a test
fails when a copy differs. The tests and `make bench` import the modules directly.

- stack.py: install the pinned stack on Colab/Kaggle, emulate devices on a CPU, say where we run
- mesh.py: the series' 2-D meshes on 1, 2, 4 or 8 devices
- data.py: TinyStories (or the offline corpus) and the GPT-2 tokenizer
- hlo.py: a compiled program's collectives (loops counted) and memory per device
- tpu.py: compile for a TPU that is not attached; "does it fit" = the compiler ran out of memory
- flops.py: a step's matmul FLOPs, the same on every backend, and the devices' peaks
- checks.py: error demonstrations that name their error; tolerances derived per number format
- figures.py: column-, row-parallel and MLP matmuls drawn per device, with their collectives

`python tools/course_cells.py --list` says which notebook uses which.
"""
