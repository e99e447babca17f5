"""tools/calib_images.py as a command: `--help` printed nothing and exited 0 (twentieth
round), so a user had no way from the shell to make the photo folders the docs use."""

import numpy as np
import pytest
from conftest import load_script

pytest.importorskip("skimage")
Image = pytest.importorskip("PIL.Image")


def test_help_says_what_it_does(capsys):
    ci = load_script("tools/calib_images.py")
    with pytest.raises(SystemExit) as e:
        ci.main(["--help"])
    assert e.value.code == 0 and "--size" in capsys.readouterr().out


def test_writes_the_images_asked_for_and_other_seeds_differ(tmp_path, capsys):
    ci = load_script("tools/calib_images.py")
    assert ci.main([str(tmp_path / "a"), "-n", "3", "--size", "40x56", "--seed", "1"]) == 0
    assert ci.main([str(tmp_path / "b"), "-n", "3", "--size", "40x56", "--seed", "2"]) == 0
    files = sorted((tmp_path / "a").glob("*.png"))
    assert len(files) == 3
    a = np.asarray(Image.open(files[0]))
    b = np.asarray(Image.open(sorted((tmp_path / "b").glob("*.png"))[0]))
    assert a.shape == (40, 56, 3) and a.std() > 0 and not np.array_equal(a, b)
    assert ci.main([str(tmp_path / "p"), "-n", "2", "--size", "32x32", "--kind", "pages",
                    "--gray"]) == 0
    assert np.asarray(Image.open(tmp_path / "p" / "pages_00000.png")).shape == (32, 32)


def test_a_bad_size_is_a_usage_error(tmp_path):
    ci = load_script("tools/calib_images.py")
    with pytest.raises(SystemExit) as e:
        ci.main([str(tmp_path), "--size", "6"])
    assert e.value.code == 2
