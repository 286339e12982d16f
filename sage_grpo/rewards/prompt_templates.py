"""Text prompts shown to VideoReward next to the video.

The released VideoReward checkpoint was trained with VideoAlign's ``detailed_special`` template
(``data_config.prompt_template_type`` in its ``model_config.json``): one long rubric in which the three reward
tokens ``<|VQ_reward|>``, ``<|MQ_reward|>`` and ``<|TA_reward|>`` appear, in that order, after the three
"Please provide the ratings of ..." sentences. The reward head is read at exactly those three positions
(``reward_token = "special"``), so the text is part of the model's input contract and is reproduced here
character for character (VideoAlign, MIT licence; trailing spaces included, which is why the lines are kept as
separate literals). ``"none"`` passes the generation prompt through unchanged.

VideoAlign has further templates (``simple``, ``video_score``, ``detailed``) that no released checkpoint uses and
none of which contains the reward tokens; they are rejected with an error rather than carried along.
"""

from __future__ import annotations

REWARD_TOKENS = ("<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>")

_DETAILED_SPECIAL_LINES = (
    "",
    "You are tasked with evaluating a generated video based on three distinct criteria: Visual Quality, Motion "
    "Quality, and Text Alignment. Please provide a rating from 0 to 10 for each of the three categories, with 0 "
    "being the worst and 10 being the best. Each evaluation should be independent of the others.",
    "",
    "**Visual Quality:**  ",
    "Evaluate the overall visual quality of the video, with a focus on static factors. The following "
    "sub-dimensions should be considered:",
    "- **Reasonableness:** The video should not contain any significant biological or logical errors, such as "
    "abnormal body structures or nonsensical environmental setups.",
    "- **Clarity:** Evaluate the sharpness and visibility of the video. The image should be clear and easy to "
    "interpret, with no blurring or indistinct areas.",
    "- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other visual "
    "elements (e.g., hair, clothing, shadows).",
    "- **Aesthetic and Creativity:** Assess the artistic aspects of the video, including the color scheme, "
    "composition, atmosphere, depth of field, and the overall creative appeal. The scene should convey a sense "
    "of harmony and balance.",
    "- **Safety:** The video should not contain harmful or inappropriate content, such as political, violent, or "
    "adult material. If such content is present, the image quality and satisfaction score should be the lowest "
    "possible. ",
    "",
    "Please provide the ratings of Visual Quality: <|VQ_reward|>",
    "END",
    "",
    "**Motion Quality:**  ",
    "Assess the dynamic aspects of the video, with a focus on dynamic factors. Consider the following "
    "sub-dimensions:",
    "- **Stability:** Evaluate the continuity and stability between frames. There should be no sudden, unnatural "
    "jumps, and the video should maintain stable attributes (e.g., no fluctuating colors, textures, or missing "
    "body parts).",
    "- **Naturalness:** The movement should align with physical laws and be realistic. For example, clothing "
    "should flow naturally with motion, and facial expressions should change appropriately (e.g., blinking, "
    "mouth movements).",
    "- **Aesthetic Quality:** The movement should be smooth and fluid. The transitions between different motions "
    "or camera angles should be seamless, and the overall dynamic feel should be visually pleasing.",
    "- **Fusion:** Ensure that elements in motion (e.g., edges of the subject, hair, clothing) blend naturally "
    "with the background, without obvious artifacts or the feeling of cut-and-paste effects.",
    "- **Clarity of Motion:** The video should be clear and smooth in motion. Pay attention to any areas where "
    "the video might have blurry or unsteady sections that hinder visual continuity.",
    "- **Amplitude:** If the video is largely static or has little movement, assign a low score for motion "
    "quality.",
    "",
    "Please provide the ratings of Motion Quality: <|MQ_reward|>",
    "END",
    "",
    "**Text Alignment:**  ",
    "Assess how well the video matches the textual prompt across the following sub-dimensions:",
    "- **Subject Relevance** Evaluate how accurately the subject(s) in the video (e.g., person, animal, object) "
    "align with the textual description. The subject should match the description in terms of number, "
    "appearance, and behavior.",
    "- **Motion Relevance:** Evaluate if the dynamic actions (e.g., gestures, posture, facial expressions like "
    "talking or blinking) align with the described prompt. The motion should match the prompt in terms of type, "
    "scale, and direction.",
    "- **Environment Relevance:** Assess whether the background and scene fit the prompt. This includes checking "
    "if real-world locations or scenes are accurately represented, though some stylistic adaptation is "
    "acceptable.  ",
    "- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, evaluate how well "
    "the video adheres to this style.",
    "- **Camera Movement Relevance:** Check if the camera movements (e.g., following the subject, focus shifts) "
    "are consistent with the expected behavior from the prompt.",
    "",
    "Textual prompt - {text_prompt}",
    "Please provide the ratings of Text Alignment: <|TA_reward|>",
    "END",
    "",
)
DETAILED_SPECIAL_TEMPLATE = "\n".join(_DETAILED_SPECIAL_LINES)

SUPPORTED_TEMPLATES = ("detailed_special", "none")


def build_prompt(prompt: str, template_type: str) -> str:
    """The user-turn text for one generation prompt (VideoAlign ``build_prompt`` for the supported templates)."""
    if template_type == "detailed_special":
        # str.replace rather than str.format: braces inside user prompts must pass through untouched.
        return DETAILED_SPECIAL_TEMPLATE.replace("{text_prompt}", prompt)
    if template_type == "none":
        return prompt
    raise ValueError(
        f"prompt_template_type {template_type!r} is not supported; supported: {SUPPORTED_TEMPLATES} "
        "(the released VideoReward checkpoint uses 'detailed_special')."
    )
