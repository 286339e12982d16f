"""Helpers shared by unit/test_i2v_trainer.py and e2e/test_i2v_trainer_runs.py."""
from model_fixtures import write_image


def write_i2v_csv(folder, rows):
    """A prompt CSV in ``folder`` whose images sit in ``folder/images`` and are named relative to the CSV."""
    (folder / "images").mkdir(parents=True, exist_ok=True)
    lines = ["prompt,seed,ref_image_path"]
    for number, (prompt, image) in enumerate(rows):
        if image:
            write_image(folder / "images" / image, 24, 40, seed=number)
        lines.append(f"{prompt},{10 + number},{'images/' + image if image else ''}")
    path = folder / "prompts.csv"
    path.write_text("\n".join(lines) + "\n")
    return path
