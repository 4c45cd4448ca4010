"""A reward a random tiny model earns unevenly, so that GRPO's advantages are not zero: the share of the
response's characters that occur in the golden answers. Two random responses almost never tie (0.5% of
pairs of uniform 16-token responses on the bundled questions), where the share of the answers' distinct
characters found in the response did in 40%: a long random response holds them all."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    wanted = set("".join(ground_truth).lower())
    text = solution_str.lower()
    return sum(char in wanted for char in text) / max(len(text), 1)
