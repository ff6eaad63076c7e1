"""Statistics and plot helpers that the envs, the trainers and the evaluation share: bootstrap intervals
(bootstrap), the checks that read a rollout record's fields (fields) and the figures' colours and writers (plots).
Below the envs, so an env's metrics never import the evaluation that calls them."""
