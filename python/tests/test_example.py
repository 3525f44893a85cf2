import os
import runpy

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "train_block.py")


def test_training_example_lowers_the_loss(device):
    main = runpy.run_path(EXAMPLE)["main"]
    losses = main(device.type, steps=4)
    assert losses[-1] < losses[0]
