"""A reward a random policy earns by chance, for runs whose updates must move: half its
responses (by the text's bytes). The real one gives a random tiny policy 0 on every
rollout on most machines, so every advantage is 0, the KL to a LoRA base is 0 while
B = 0, and the weights (adapters) would never move."""


def chance_reward(text, target, **_):
    from guilibra_jax.rewards import GuiLibraReward
    r = float(sum(text.encode()) % 2)
    return GuiLibraReward(format=r, action_type=r, value=r, grounding=r, accuracy=r, total=r)
