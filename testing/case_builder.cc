// placeholder until the case builder lands
