# Optional CUDA path (FT_CUDA=AUTO|ON|OFF). Filled in by the CUDA work; AUTO finds nvcc.
