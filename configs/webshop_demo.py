"""WebShop's embedded default: a tiny Qwen2 is trained to shop in a generated store on a laptop CPU.

    python -m roleagent_jax.main --config=configs/webshop_demo.py

A byte-level BPE is trained on shop text, a 3-layer Qwen2 is warm-started on the expert's purchases
(search the instruction's words, open the product, click its options, buy; agent and predictor roles),
then Role-Agent RL (GiGPO + WIA + AIW with WebShop's heuristic analyser) runs. Evaluation runs before
and after RL on held-out goals of a shop of its own: seen product families (gen_test) and families never
trained on (gen_unseen).

It does not learn yet: the warm-started model memorises the training pages but does not copy the
instruction's words into a search or a product id into a click, and wins none of the held-out goals
after its warm start (docs/experiments.md).
"""

from configs import demo


def get_config():
    c = demo.get_config()  # the ALFWorld demo's model, optimiser, advantage and AIW settings
    c.workdir = "runs/webshop_demo"
    c.iterations = 6

    c.env.name = "webshop"
    del c.env["alfworld"]
    # 120 goals per seen split, 60 unseen; 5 results a page (WebShop: 10) cut the longest prompt from about
    # 840 to 560 tokens, and
    # the expert's search still finds the goal's product on the first page for 119 of 120 training goals
    c.env.webshop = {"n_products": 300, "page_size": 5}
    c.env.train_split = "gen_train"
    c.env.eval_splits = ("gen_test", "gen_unseen")
    c.env.max_steps = 15
    c.env.history_k = 1
    c.env.gen.n_train = 120
    c.env.gen.n_eval = 48  # per split; one goal = 2.1 points

    c.rollout.max_prompt_tokens = 640  # the longest prompt of a 5-result page is about 560 tokens
    c.rollout.max_response_tokens = 40
    c.wia.max_tokens = 64

    c.warmstart.n_games = 120
    c.warmstart.steps = 300  # x 16 rows: about 6 epochs of the expert's ~740 examples
    c.warmstart.batch_rows = 16
    return c
