"""A reward a random tiny model earns unevenly (so GRPO advantages are non-zero): the share of the golden
answers' distinct characters that the response contains."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    wanted = set("".join(ground_truth).lower())
    return len(wanted & set(solution_str.lower())) / max(len(wanted), 1)
