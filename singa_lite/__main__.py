"""`python -m singa_lite`: what this installation was built with and what it can use."""
import json

import singa_lite


def main() -> None:
    info = singa_lite.build_info()
    print(f"singa_lite {info['version']}  ({info['compiler']}, {info['build_type']}, OpenMP {info['openmp']})")
    print(f"  BLAS : {info['blas']['package']}  [{info['blas']['config']}]")
    cuda = info["cuda"]
    if cuda["compiled"]:
        print(f"  CUDA : compiled with nvcc {cuda['compiler_version']}, runtime {cuda['runtime_version']}, "
              f"driver {cuda['driver_version'] or 'none'}, {cuda['device_count']} GPU(s) visible")
        if cuda["device_count"] == 0:
            print(f"         {singa_lite._core.cuda_unavailable_reason()}")
        blas = cuda["cublas"]
        print(f"  cuBLAS: {'version ' + str(blas['version']) + ', ' if blas['version'] else ''}{blas['status']}")
    else:
        print("  CUDA : not compiled in (CPU-only build)")
        print(f"         {singa_lite._core.cuda_unavailable_reason()}")
    dnn = info["cudnn"]
    if dnn["used"]:
        print(f"  cuDNN: version {dnn['version']}, used for convolution, pooling and batch norm ({dnn['status']})")
    else:
        version = f"version {dnn['version']}, " if dnn["version"] else ""
        print(f"  cuDNN: {version}not used: {dnn['reason']}; convolution runs as im2col + GEMM, pooling and batch "
              f"norm on the own kernels")
    dnnl = info["onednn"]
    print(f"  oneDNN: {dnnl['status']}" + ("; float32 CPU convolutions run on it" if dnnl["used"] else
                                         "; CPU convolutions run as im2col + GEMM"))
    nccl = info["nccl"]
    print(f"  NCCL : {'version ' + str(nccl['version']) if nccl['version'] else nccl['status'].splitlines()[0]}")
    print(f"  threads: {singa_lite.device.get_num_threads()}")
    malloc = info["malloc"]
    print("  malloc: " + (f"left alone ({malloc['left_alone']})" if "left_alone" in malloc else
                          f"mmap threshold {malloc['mmap_threshold'] >> 20} MiB, trim threshold "
                          f"{malloc['trim_threshold'] >> 20} MiB (SINGA_LITE_MALLOC=keep leaves it alone)"))
    print(json.dumps(info, indent=None, default=str))


if __name__ == "__main__":
    main()
