"""python -m kiln_executorch_runtime [--cmake-prefix-path | --info]"""

import argparse
import json

import kiln_executorch_runtime as rt

parser = argparse.ArgumentParser(prog="python -m kiln_executorch_runtime")
parser.add_argument("--cmake-prefix-path", action="store_true", help="print CMAKE_PREFIX_PATH")
parser.add_argument("--info", action="store_true", help="print versions and the device in use")
args = parser.parse_args()

if args.cmake_prefix_path:
    print(rt.cmake_prefix_path())
else:
    print(json.dumps(rt.backend_info(), indent=2))
