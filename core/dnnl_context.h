// The process-wide oneDNN CPU engine and stream. oneDNN runs on the OpenMP thread pool, whose size
// the app sets from train.threads before the first primitive is made.
// Thread safety: creation is thread-safe (function statics); primitives execute on one thread.
#pragma once
#include <dnnl.hpp>

namespace ft {

dnnl::engine& cpu_engine();
dnnl::stream& cpu_stream();

}  // namespace ft
