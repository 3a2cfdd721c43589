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
    else:
        print("  CUDA : not compiled in (CPU-only build)")
    for name in ("cudnn", "nccl"):
        part = info[name]
        print(f"  {name:<5}: {'version ' + str(part['version']) if part['compiled'] else 'not compiled in'}")
    print(f"  threads: {singa_lite.device.get_num_threads()}")
    print(json.dumps(info, indent=None, default=str))


if __name__ == "__main__":
    main()
