"""Runs a faulty backend's region: computes it with numpy, or fails the way its mode says."""

import json
import os
import time

import numpy as np


def load(path, engines=None):
    spec = json.loads(open(path).read())

    def run(inputs, outputs):
        if spec["mode"] == "crash":
            os.abort()
        if spec["mode"] == "raise":
            raise ValueError("the engine refused this input")
        if spec["mode"] == "hang":
            time.sleep(3600)
        fn = np.add if spec["op"] == "stablehlo.add" else np.multiply
        outputs[0][...] = fn(inputs[0], inputs[-1]) + (1.0 if spec["mode"] == "wrong" else 0.0)

    return run
