"""data/make_detection.py: a COCO-format detection set that loads the way COCO does."""
import importlib.util
import json

import pytest
import torch

from harness import REPO


def _make_detection():
    spec = importlib.util.spec_from_file_location("make_detection", REPO / "data" / "make_detection.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return _make_detection().make(tmp_path_factory.mktemp("shapes"), train=24, val=8, image_size=96)


def test_detection_set_loads_through_torchvision_coco_detection(shapes):
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2

    for split, count in (("train2017", 24), ("val2017", 8)):
        dataset = wrap_dataset_for_transforms_v2(
            CocoDetection(shapes / split, shapes / "annotations" / f"instances_{split}.json"))
        assert len(dataset) == count
        for image, target in dataset:
            assert image.size == (96, 96)
            boxes = torch.as_tensor(target["boxes"])
            assert 1 <= len(boxes) <= 4
            assert (boxes[:, 2:] > boxes[:, :2]).all() and (boxes >= 0).all() and (boxes <= 96).all()
            assert set(target["labels"].tolist()) <= {1, 2, 3, 4, 5}


def test_detection_boxes_score_perfectly_in_pycocotools(shapes):
    """The ground truth, submitted as detections, gets mAP 1: the annotations are valid COCO."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO(str(shapes / "annotations" / "instances_val2017.json"))
        detections = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0}
                      for a in truth.dataset["annotations"]]
        evaluation = COCOeval(truth, truth.loadRes(detections), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    assert evaluation.stats[0] == pytest.approx(1.0)


def test_detection_object_pixels_carry_their_class_colour(shapes):
    """The box centre of a filled shape shows its class's hue: what makes the set learnable."""
    from PIL import Image

    make_detection = _make_detection()
    coco = json.loads((shapes / "annotations" / "instances_train2017.json").read_text())
    files = {image["id"]: image["file_name"] for image in coco["images"]}
    checked = 0
    for annotation in coco["annotations"]:
        if annotation["category_id"] == 5:  # a ring's centre is its hole
            continue
        x, y, w, h = annotation["bbox"]
        pixel = Image.open(shapes / "train2017" / files[annotation["image_id"]]).getpixel((int(x + w / 2), int(y + h * 0.6)))
        colour = make_detection.COLOURS[annotation["category_id"]]
        occluded = any(other["image_id"] == annotation["image_id"] and other["id"] > annotation["id"]
                       for other in coco["annotations"])
        if not occluded:
            assert max(abs(p - c) for p, c in zip(pixel, colour)) <= 45, (annotation, pixel, colour)
            checked += 1
    assert checked >= 10


def test_detection_set_is_the_same_for_the_same_seed(tmp_path):
    make = _make_detection().make
    first = make(tmp_path / "a", train=4, val=2, image_size=64)
    second = make(tmp_path / "b", train=4, val=2, image_size=64)
    for name in ("instances_train2017.json", "instances_val2017.json"):
        assert (first / "annotations" / name).read_text() == (second / "annotations" / name).read_text()
