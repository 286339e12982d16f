"""Image-to-video generation end to end from a prompt CSV."""
import json

import imageio
import generate

from model_fixtures import write_image


def test_generate_i2v_csv_end_to_end(tiny_i2v_root, tmp_path):
    write_image(tmp_path / "ball.png", 40, 40)
    csv = tmp_path / "p.csv"
    csv.write_text("prompt,seed,ref_image_path\nA red ball rolls,3,ball.png\nA ball bounces,4,ball.png\n")
    out = tmp_path / "samples.mp4"
    assert generate.main(["--model_path", str(tiny_i2v_root), "--valid_video_csv", str(csv), "--output_path",
                          str(out), "--fixed_size", "16x16", "--video_length", "5", "--num_inference_steps", "2",
                          "--dtype", "fp32", "--device", "cpu", "--text_max_length", "16",
                          "--byt5_max_length", "8"]) == 0
    videos = sorted((tmp_path / "samples").glob("*.mp4"))
    assert len(videos) == 2 and len(imageio.mimread(videos[0])) == 5
    settings = json.loads(videos[0].with_name(f"{videos[0].stem}_config.json").read_text())
    assert settings["task"] == "i2v" and settings["transformer_version"] == "480p_i2v"
    assert settings["image_path"] == str(tmp_path / "ball.png") and (settings["height"], settings["width"]) == (16, 16)
